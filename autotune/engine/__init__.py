"""The engine: plan, the search loop, successive halving, executors and workers, timers."""
