"""Datasets: the original MNIST files (checksummed) and the images the experiments derive from them."""
