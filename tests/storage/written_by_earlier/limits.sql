BEGIN TRANSACTION;
CREATE TABLE rate_events (
            identity TEXT NOT NULL,
            unit TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            cost BIGINT NOT NULL
        );
INSERT INTO "rate_events" VALUES('key:k','requests',1.79592341129461288457e+09,1);
INSERT INTO "rate_events" VALUES('key:k','characters',1.79592341129461288457e+09,10);
CREATE TABLE schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (component, version)
);
INSERT INTO "schema_migrations" VALUES('rate_limits',1,1.79592341133083796501e+09);
CREATE INDEX rate_events_by_identity ON rate_events (identity, unit, at);
COMMIT;
