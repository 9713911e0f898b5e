"""Process group, sharding plan and sharders: how the model is spread over ranks."""
