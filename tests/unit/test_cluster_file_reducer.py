"""A cluster file's `reducer` is what `floe restart` and `floe scale --add` pass to a
node's --reducer, which imports the module it names: only a built-in name, or the
reducer the cluster's kept layout records, is ever started; anything else is refused
in one line and nothing runs. Real `floe` processes on forged cluster files."""

from __future__ import annotations

import json
import os


from floering.floe.records import reducer_refusal


def test_only_built_ins_or_the_kept_layouts_reducer_are_taken(tmp_path):
    assert reducer_refusal("count", None) is None
    assert reducer_refusal("topk", None) is None
    spec = "tests.property.test_reducers:Concat"
    assert "neither a built-in" in reducer_refusal(spec, None)
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    layout = data / "layout.json"
    layout.write_text(json.dumps({"reducer": spec, "nodes": []}))
    os.chmod(layout, 0o600)
    assert reducer_refusal(spec, str(data)) is None                 # as the cluster began
    assert "neither a built-in" in reducer_refusal("os:system", str(data))
    os.chmod(layout, 0o620)                      # one anyone in the group could rewrite
    assert "neither a built-in" in reducer_refusal(spec, str(data))
