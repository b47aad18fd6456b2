"""opendit_lite: fast, cheap diffusion-transformer training on Colossal-AI."""

__version__ = "0.1.0"
