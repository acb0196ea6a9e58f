"""The batch service\x27s pure parts: Batch API input rules and the drain lease."""
