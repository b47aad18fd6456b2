from .vae import load_vae, vae_decode, vae_encode

__all__ = ["load_vae", "vae_decode", "vae_encode"]
