"""The processes of the multi-process service: the supervisor that starts, watches and
restarts them, an engine core per model replica, and the HTTP front-ends."""
