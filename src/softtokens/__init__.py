"""softtokens: RL on hard, soft and fuzzy chains of thought (Butt et al., 2025)."""

__version__ = "0.1.0"
