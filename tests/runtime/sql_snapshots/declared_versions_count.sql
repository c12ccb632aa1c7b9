SELECT count(*) AS versions FROM runtime_declaredtoolversion
