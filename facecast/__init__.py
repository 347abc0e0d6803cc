"""The `facecast` command, above the other packages: `pipeline` (the engine), `realtime`
(serving) and `facecast_client` (calling a server: `facecast call`). None imports this one,
`pipeline` never imports `realtime`, and neither imports `facecast_client`."""
