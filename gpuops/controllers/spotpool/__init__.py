"""The spot pool controller: keeps a pool of spot GPU instances between its minimum and maximum on a cloud API,
replacing reclaimed ones, never buying twice (client tokens persisted before the call, ownership tags)."""
