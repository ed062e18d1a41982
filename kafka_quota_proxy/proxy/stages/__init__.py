"""The request and response stages, one file each; chain.py orders them."""
