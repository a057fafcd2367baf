"""The lab's database: the connection and its migrations (SQLite or Postgres), the SQL both
speak, the store of pairs, runs and records, and `crashdrill doctor postgres`.
"""
