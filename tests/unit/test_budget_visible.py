"""What a node's budget of request bytes (node.transport.budget.RequestBytes) did is
visible: calls refused and waiting, their wait, bytes held and the most held, in the
Stats RPC (`floe status --json`) and in /metrics. A real TLS node: a client holds its
whole share of the budget with calls whose requests it has not sent yet."""


import pytest


@pytest.mark.parametrize("argv, wrong", [
    (["--request-wait", "0"], "request_wait"),
    (["--request-wait", "nan"], "request_wait"),
    (["--request-wait", "601"], "request_wait"),
    (["--max-request-bytes", "-1"], "max_request_bytes"),
])
def test_the_budget_flags_are_checked(argv, wrong):
    from floering.node.config import load_config
    with pytest.raises(ValueError, match=wrong):
        load_config(["--node-id", "n0", "--listen", "127.0.0.1:7000",
                     "--peers", "n0=127.0.0.1:7000", "--insecure", *argv], environ={})
