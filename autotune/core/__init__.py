"""Core values: Problem, buckets, Tactic, Verdict, Arch, Env, records, FP4 formats.

Nothing here imports another part of the project; torch only in the modules that hold tensors.
"""
