"""The `facecast` command, above both packages: `pipeline` (the engine) and `realtime`
(serving). Neither imports this one, and `pipeline` never imports `realtime`."""
