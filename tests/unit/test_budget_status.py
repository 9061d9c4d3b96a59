"""The budgets of request bytes in the plain `floe status` table (a `requests` column:
bytes held / the bound, and calls refused if any) and in the Grafana dashboard."""


from floering.floe.cli import budget_cell
from floering.floe.grafana import dashboard, queries


def test_the_cell_gives_bytes_held_the_bound_and_refusals():
    row = dict(request_budget_bytes=3 << 20, request_budget_limit_bytes=576 << 20,
               request_budget_refused=0)
    assert budget_cell(row) == "3/576 MiB"
    assert budget_cell(dict(row, request_budget_refused=1234)) == "3/576 MiB 1,234 refused"
    assert budget_cell({}) == "-"                 # a node that does not report them


def test_the_dashboard_has_a_panel_of_request_bytes_and_one_of_waits_and_refusals():
    board = dashboard()
    panels = {p["title"]: p for p in board["panels"]}
    held = " ".join(t["expr"] for t in panels["Request bytes held"]["targets"])
    for name in ("floe_request_budget_bytes", "floe_request_budget_peak_bytes",
                 "floe_request_budget_limit_bytes"):
        assert name + '{job=~"$job"}' in held
    waits = " ".join(t["expr"] for t in
                     panels["Request budget: waits and refusals /s"]["targets"])
    for name in ("floe_request_budget_waited_total", "floe_request_budget_refused_total",
                 "floe_request_budget_waiting"):
        assert name in waits
    assert any("floe_request_budget_wait_seconds_total" in q for q in queries(board))
