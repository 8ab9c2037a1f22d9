"""The desktop: an X display the runtime starts and owns, its screen and its pointer."""
