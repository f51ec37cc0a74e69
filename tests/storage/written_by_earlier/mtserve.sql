BEGIN TRANSACTION;
CREATE TABLE deepl_usage (
            identity TEXT NOT NULL,
            period TEXT NOT NULL,
            characters BIGINT NOT NULL,
            memory_segments BIGINT NOT NULL,
            PRIMARY KEY (identity, period)
        );
INSERT INTO "deepl_usage" VALUES('key:k','2026-11',12,1);
CREATE TABLE glossaries (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            source_lang TEXT NOT NULL,
            target_lang TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            entry_count INTEGER NOT NULL
        , owner_key TEXT);
INSERT INTO "glossaries" VALUES('54ec8c54f9a1499591a94b584f7bb861','ui','en','de',1.79592340522141671182e+09,2,NULL);
INSERT INTO "glossaries" VALUES('10d745a9a7aa45dc8a606e5dd82acec3','mine','en','de',1.79592340534188842776e+09,1,'key-abc');
CREATE TABLE glossary_entries (
            glossary_id TEXT NOT NULL REFERENCES glossaries(id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            source TEXT NOT NULL,
            target TEXT NOT NULL,
            PRIMARY KEY (glossary_id, position)
        );
INSERT INTO "glossary_entries" VALUES('54ec8c54f9a1499591a94b584f7bb861',0,'save','sichern');
INSERT INTO "glossary_entries" VALUES('54ec8c54f9a1499591a94b584f7bb861',1,'file','Datei');
INSERT INTO "glossary_entries" VALUES('10d745a9a7aa45dc8a606e5dd82acec3',0,'open','öffnen');
CREATE TABLE memories (
            id TEXT PRIMARY KEY,
            source_lang TEXT NOT NULL,
            target_lang TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL,
            updated_at DOUBLE PRECISION NOT NULL
        , owner_key TEXT);
INSERT INTO "memories" VALUES('default:en-de','en','de',1.79592340535434961314e+09,1.79592340535434961314e+09,NULL);
INSERT INTO "memories" VALUES('key-abc/docs','en','de',1.79592340536725521087e+09,1.79592340536725521087e+09,'key-abc');
CREATE TABLE memory_entries (
            memory_id TEXT NOT NULL REFERENCES memories(id) ON DELETE CASCADE,
            source_key TEXT NOT NULL,
            source TEXT NOT NULL,
            target TEXT NOT NULL,
            PRIMARY KEY (memory_id, source_key)
        );
INSERT INTO "memory_entries" VALUES('default:en-de','Save the file','Save the file','Datei speichern');
INSERT INTO "memory_entries" VALUES('key-abc/docs','Close','Close','Schließen');
CREATE TABLE schema_migrations (
    component TEXT NOT NULL,
    version INTEGER NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (component, version)
);
INSERT INTO "schema_migrations" VALUES('glossaries',1,1.79592340531470274923e+09);
INSERT INTO "schema_migrations" VALUES('glossaries',2,1.79592340531513857846e+09);
INSERT INTO "schema_migrations" VALUES('memories',1,1.7959234053537175656e+09);
INSERT INTO "schema_migrations" VALUES('memories',2,1.79592340535400867462e+09);
INSERT INTO "schema_migrations" VALUES('deepl_usage',1,1.79592340537818980221e+09);
COMMIT;
