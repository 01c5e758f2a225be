"""unsupmt: XLM's unsupervised machine translation."""
