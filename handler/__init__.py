"""Grouping handlers: the LOCAL arbiter of group bindings and the REMOTE proxy that asks it."""
