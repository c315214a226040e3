"""The Kafka layer: settings, client factories, topic administration, the outbox, request-reply."""
