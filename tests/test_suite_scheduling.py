"""The suite's own scheduling. scripts/test.sh runs two pytest-xdist workers with --dist loadgroup: the tests of
one xdist_group (the local notebooks, a module sharing its launches) must reach the scheduler as one group, or
each worker repeats the group's set-up. pytest 9.2 silently dropped the group (pytest-xdist#1386)."""
import pytest


@pytest.mark.xdist_group("suite-scheduling")
def test_a_grouped_test_reaches_the_scheduler_with_its_group(request):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under pytest-xdist's --dist loadgroup only (scripts/test.sh)")
    assert request.node.nodeid.endswith("@suite-scheduling"), request.node.nodeid
