"""turbotrain: fast, Hydra-configured training and INT8 export of image and text classifiers."""

__version__ = "0.1.0"
