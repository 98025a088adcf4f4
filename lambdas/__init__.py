"""Lambda handlers that the platform's state machines call, and the pure code they share."""
