"""Every correct candidate profiled like a user's kernel item."""
