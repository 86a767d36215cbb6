"""Store: the Optuna study of a search and its storages (`study`; the journal file, `journal`,
`journal_records`, and PostgreSQL, `journal_postgres`), and the measurement log beside it
(`records`); who is searching, by which searchers sharing a study tell one that is gone
(`searchers`)."""
