"""stylegan: StyleGAN config F at 1024x1024."""
