"""The data path: a client connection, its broker connection, and the bytes between them."""
