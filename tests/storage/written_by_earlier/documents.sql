BEGIN TRANSACTION;
CREATE TABLE document_files (
            job_id TEXT NOT NULL REFERENCES document_jobs(id) ON DELETE CASCADE,
            kind TEXT NOT NULL,
            content BLOB NOT NULL,
            PRIMARY KEY (job_id, kind)
        );
INSERT INTO "document_files" VALUES('05e2e997079144f7a34f010bd0c28cfd','upload',X'53617665207468652066696C650A');
INSERT INTO "document_files" VALUES('05e2e997079144f7a34f010bd0c28cfd','result',X'44617465692073706569636865726E0A');
INSERT INTO "document_files" VALUES('bf62c7961d5b4b8aaef44f3206c281f2','upload',X'436C6F73650A');
CREATE TABLE document_jobs (
            id TEXT PRIMARY KEY,
            key TEXT NOT NULL,
            filename TEXT NOT NULL,
            source_lang TEXT NOT NULL,
            target_lang TEXT NOT NULL,
            status TEXT NOT NULL,
            sentences_total INTEGER NOT NULL,
            sentences_done INTEGER NOT NULL,
            characters BIGINT NOT NULL,
            error TEXT,
            result_name TEXT,
            created_at DOUBLE PRECISION NOT NULL,
            started_at DOUBLE PRECISION,
            finished_at DOUBLE PRECISION
        , owner_key TEXT, lease_holder TEXT, lease_until DOUBLE PRECISION);
INSERT INTO "document_jobs" VALUES('05e2e997079144f7a34f010bd0c28cfd','c0257a22e4b147cea1bb077ba32161b6','a.txt','en','de','done',1,1,13,NULL,'a.txt',1.79592340538159441951e+09,1.79592340543152165417e+09,1.79592340544105029103e+09,'key-abc','holder-x',NULL);
INSERT INTO "document_jobs" VALUES('bf62c7961d5b4b8aaef44f3206c281f2','9747674f400a4a1887173501aa70b1f9','b.txt','en','de','queued',1,0,5,NULL,NULL,1.79592340545044612887e+09,NULL,NULL,NULL,NULL,NULL);
CREATE TABLE schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (component, version)
);
INSERT INTO "schema_migrations" VALUES('document_jobs',1,1.79592340541053199767e+09);
INSERT INTO "schema_migrations" VALUES('document_jobs',2,1.79592340541150712962e+09);
CREATE INDEX document_jobs_by_status ON document_jobs (status, created_at);
COMMIT;
