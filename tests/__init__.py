"""mxgemm tests (a package so that ``from tests import oracle`` works under any invocation)."""
