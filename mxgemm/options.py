"""The names users pick from (scale modes, roundings, activation dtypes), without importing torch: the
command line lists them in ``--help``, which must stay fast."""

SCALE_MODES = ("floor", "rceil", "even", "ceil", "mse")
ROUNDINGS = ("even", "away", "zero", "up", "down", "stochastic")
A_DTYPE_NAMES = ("float16", "bfloat16")
