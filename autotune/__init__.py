from autotune.problem import Problem  # noqa: F401
