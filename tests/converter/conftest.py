import tests.kernels.interpreter  # noqa: F401  (sets TRITON_INTERPRET=1 without a GPU, see there)
