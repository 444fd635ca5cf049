"""The data plane: the declarative table of /social/ endpoints and the upstream client."""
