"""Tools that check the `triton` family's static shared-memory models against the compiler by
cross-compiling (no GPU): `shared_of` (one config's compiled figures), `fit_epilogue` (re-derive
the sm8x epilogue set of tactics/triton_fp4/smem.py) and `w4a4_sweep` (the W4A4 member's whole
space on every target). bench/triton_smem_table.py and the cross-compile tests use them; the
family itself never does."""
