"""Window-serializability (ws) and latest-window-serializability (lws) checkers."""
