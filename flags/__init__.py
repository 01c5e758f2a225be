"""absl flag definitions, grouped by concern. These modules import nothing but absl."""
