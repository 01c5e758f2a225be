"""deeplabv3: DeepLabv3+ with aligned Xception-65."""
