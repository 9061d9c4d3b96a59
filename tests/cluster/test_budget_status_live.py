"""The budgets of request bytes in the plain `floe status` table (a `requests` column: bytes
held / the bound, and calls refused if any) and in the Grafana dashboard.

The tests here start real node processes; the in-process ones are in
tests/unit/test_budget_status.py.
"""

import pytest

from tests.support.helpers import floe, floe_run, status


@pytest.mark.multiprocess
def test_floe_status_shows_the_requests_column_of_every_member(tmp_path):
    try:
        floe(tmp_path, "up", "--nodes", "2", "--memory")
        rows = status(tmp_path)
        table = floe(tmp_path, "status").splitlines()
    finally:
        floe_run(tmp_path, "down", "--kill")
    header = next(line for line in table if line.split()[:2] == ["node", "state"])
    assert "requests" in header.split()
    at = header.index("requests")
    assert len(rows) == 2
    for node_id, row in rows.items():
        line = next(line for line in table if line.split()[:1] == [node_id])
        held, bound = row["request_budget_bytes"], row["request_budget_limit_bytes"]
        assert bound > 0
        # what the node held when the table was asked: the table's own call at most
        assert line[at:].startswith(("0/", "8/")), (line, at)
        assert f"/{bound >> 20} MiB" in line[at:], (line, held, bound)
