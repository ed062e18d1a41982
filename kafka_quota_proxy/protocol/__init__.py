"""Sans-I/O Kafka protocol code: frames, headers and the few messages the proxy rewrites.

Nothing here touches a socket, a clock or an event loop: bytes go in, values or bytes come out.
"""
