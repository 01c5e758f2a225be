"""Results: records, the store, and the report's tables and charts."""
