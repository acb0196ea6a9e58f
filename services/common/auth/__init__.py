"""Who may call and over what: TLS, bearer tokens and the bind rule, the local CA, credentials kept out of errors and
logs."""
