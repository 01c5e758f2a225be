"""nasnet_large: NASNet-A Large."""
