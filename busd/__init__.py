"""busd: Azure Service Bus sessions semantics over AMQP 1.0, with all state in Redis or Valkey."""

__version__ = "0.1.0"
