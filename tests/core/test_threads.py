"""Default torch threads: the usable cores shared among workers; OMP_NUM_THREADS wins."""

from verispec.core.threads import default_threads


def test_default_threads():
    assert default_threads(1, cores=2) == 2 and default_threads(2, cores=2) == 1 and default_threads(4, cores=2) == 1
    assert default_threads(1, environ={"OMP_NUM_THREADS": "1"}) == 1  # the user's choice wins
    assert default_threads(2, environ={"OMP_NUM_THREADS": "8"}) == 4
    assert default_threads(1, environ={"OMP_NUM_THREADS": "junk"}) >= 1
