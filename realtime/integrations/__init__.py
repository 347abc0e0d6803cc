"""Adapters that put Facecast inside agent frameworks (Pipecat: `realtime.integrations.pipecat`)."""
