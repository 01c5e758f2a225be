"""pix2pixhd: the local-enhancer generator and three multiscale discriminators."""
