"""The only place with sockets, tasks and the event loop: listeners, connections, lifecycle."""
