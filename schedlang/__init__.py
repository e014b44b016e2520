"""schedlang: a scheduling DSL for pipeline and sequence parallelism of linear-recurrence models."""

__version__ = "0.1.0"
