"""spark_driver.pyspark_path on made-up Python paths: Spark's pyspark and py4j zips move
behind an installed copy of the same version only, and nothing else on the path moves."""

import zipfile

from floering.spark_driver.pyspark_path import prefer_installed


def spark_home(tmp_path, pyspark="4.3.0", py4j="0.10.9.9"):
    """A SPARK_HOME/python/lib with the two zips; returns their paths."""
    lib = tmp_path / "spark" / "python" / "lib"
    lib.mkdir(parents=True)
    made = []
    for package, version, name in (("pyspark", pyspark, "pyspark.zip"),
                                   ("py4j", py4j, f"py4j-{py4j}-src.zip")):
        with zipfile.ZipFile(lib / name, "w") as z:
            z.writestr(f"{package}/__init__.py", "")
            z.writestr(f"{package}/version.py", f"__version__: str = '{version}'\n")
        made.append(str(lib / name))
    return made


def site_packages(tmp_path, pyspark="4.3.0", py4j="0.10.9.9"):
    site = tmp_path / "site-packages"
    for package, version in (("pyspark", pyspark), ("py4j", py4j)):
        if version is not None:
            (site / package).mkdir(parents=True)
            (site / package / "__init__.py").write_text("")
            (site / package / "version.py").write_text(f"__version__ = '{version}'\n")
    site.mkdir(exist_ok=True)
    return str(site)


def test_the_zips_move_behind_an_installed_copy_of_their_version(tmp_path):
    zips = spark_home(tmp_path)
    site = site_packages(tmp_path)
    path = ["/app", *zips, "/jars/spark-core.jar", "/checkout/proto", site]
    said = prefer_installed(path)
    assert path == ["/app", "/jars/spark-core.jar", "/checkout/proto", site, *zips]
    assert said.startswith("the installed copy")


def test_a_different_version_or_none_installed_keeps_the_zip_first(tmp_path):
    zips = spark_home(tmp_path)
    for name, versions in (("older", {"pyspark": "3.5.1"}), ("none", {"pyspark": None})):
        site = site_packages(tmp_path / name, **versions)
        path = ["/app", *zips, site]
        said = prefer_installed(path)
        # py4j is the same version, so only its zip moves
        assert path == ["/app", zips[0], site, zips[1]], name
        assert said == (f"Spark's pyspark.zip: the installed pyspark is "
                        f"{versions['pyspark'] or 'missing'}, the zip 4.3.0"), name


def test_only_the_first_installed_copy_counts(tmp_path):
    zips = spark_home(tmp_path)
    shadow = site_packages(tmp_path / "shadow", pyspark="3.5.1", py4j="0.10.9.7")
    site = site_packages(tmp_path)
    path = [*zips, shadow, site]
    prefer_installed(path)
    assert path == [*zips, shadow, site]     # the copy that would be imported differs


def test_a_path_without_spark_zips_is_left_alone(tmp_path):
    site = site_packages(tmp_path)
    path = ["/app", site]
    assert prefer_installed(path) == "no pyspark.zip on the path"
    assert path == ["/app", site]
