"""Testing a model: the math benchmarks under the six inference settings, the out-of-domain
multiple-choice benchmarks, and the metrics (pass@k, entropy)."""
