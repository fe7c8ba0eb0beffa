"""State in Redis or Valkey: the Store API, its Redis implementation and the embedded server."""
