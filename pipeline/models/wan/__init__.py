"""The Wan 2.1 family's shared pieces, for the open models built on it (SoulX-FlashHead, …)."""
