"""The one version source for the package and the runtime it ships.

Kept in its own standard-library-only module so the frozen runtime can import it
without pulling in anything from the host side.
"""

__version__ = "0.1.0"
