-- The telemetry warehouse (docs/ARCHITECTURE.md, "The warehouse"): names and columns are a contract.
-- Every statement is idempotent so the schema can be applied on every connection.
-- Primary keys make writes idempotent: a rerun after a crash inserts OR IGNOREs by key.

CREATE TABLE IF NOT EXISTS questions (
    question_id VARCHAR PRIMARY KEY,  -- MATH unique_id or gsm8k:<split>:<line>
    corpus      VARCHAR NOT NULL,     -- math | gsm8k
    split       VARCHAR NOT NULL,     -- the source's own split: train | test
    problem     VARCHAR NOT NULL,
    answer      VARCHAR NOT NULL,
    subject     VARCHAR,
    level       INTEGER,
    in_math500  BOOLEAN NOT NULL DEFAULT FALSE
);

CREATE TABLE IF NOT EXISTS calls (
    call_id           VARCHAR PRIMARY KEY,
    run_id            VARCHAR NOT NULL,
    kind              VARCHAR NOT NULL,  -- probe | step | conductor
    question_id       VARCHAR NOT NULL,
    worker            VARCHAR NOT NULL,
    sample            INTEGER NOT NULL,
    subtask           VARCHAR,
    response          VARCHAR,
    extracted_answer  VARCHAR,
    correct           BOOLEAN,           -- NULL when the status is not scored
    status            VARCHAR NOT NULL,  -- ok | truncated | empty | transient | terminal | not_recorded
    error             VARCHAR,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    cost_usd          DOUBLE,
    latency_s         DOUBLE,
    started_at        TIMESTAMP,
    pool              VARCHAR,
    workflow_id       VARCHAR,
    step              INTEGER,
    reasoning_tokens  INTEGER,
    tokens_estimated  BOOLEAN DEFAULT FALSE,
    finish_reason     VARCHAR,
    attempts          INTEGER DEFAULT 1
);

-- Topology: how many earlier step results the call's context held (0 for probes and single
-- steps). Rows written before the column existed keep NULL: unknown, not zero.
ALTER TABLE calls ADD COLUMN IF NOT EXISTS visible_steps INTEGER;
-- The grader whose rules gave `correct` (conductor_pipeline.grader_version.GRADER_VERSION). Rows that
-- existed before the column get '1' (the grader before versions were recorded); rows written
-- without a version get the current one. The default below must equal GRADER_VERSION.
ALTER TABLE calls ADD COLUMN IF NOT EXISTS grader_version VARCHAR DEFAULT '1';
ALTER TABLE calls ALTER COLUMN grader_version SET DEFAULT '2';

CREATE TABLE IF NOT EXISTS workflows (
    workflow_id   VARCHAR PRIMARY KEY,
    run_id        VARCHAR NOT NULL,
    question_id   VARCHAR NOT NULL,
    conductor     VARCHAR NOT NULL,
    raw_text      VARCHAR,
    parse_code    VARCHAR NOT NULL,  -- ok or a workflow failure code
    n_steps       INTEGER NOT NULL,
    workers       VARCHAR[],
    final_answer  VARCHAR,
    correct       BOOLEAN,
    cost_usd      DOUBLE,
    latency_s     DOUBLE,
    arm           VARCHAR,
    repeat        INTEGER DEFAULT 0,
    infra_failure BOOLEAN DEFAULT FALSE
);
-- Training rollouts (NULL on evaluation workflows): the phase of the run that sampled it
-- (parse_check_before | parse_check_after | probe | prune_audit | grpo), its optimizer step (NULL
-- outside GRPO steps) and its position in that step's generation batch.
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS phase VARCHAR;
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS training_step INTEGER;
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS rollout INTEGER;
-- Recursion: a workflow a conductor seat wrote inside another one (NULL/0 on top-level workflows).
-- `parent_workflow_id` and `parent_step` name the step that called the conductor, `depth` counts
-- levels below the top (1 = called from a top-level step), `root_workflow_id` is the top-level
-- workflow whose arm and question it answers. Its calls carry its own `workflow_id`.
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS parent_workflow_id VARCHAR;
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS parent_step INTEGER;
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS depth INTEGER DEFAULT 0;
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS root_workflow_id VARCHAR;

-- The workers the conductor's prompt listed, real names in the order it listed them (its
-- catalogue: a training sub-pool, or the pool in file or shuffled order); a step's catalogue
-- position is list_position(catalogue, worker) - 1. NULL on workflows no conductor wrote (solo
-- arms, routers, votes) and on rows written before the column existed.
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS catalogue VARCHAR[];

-- As on `calls`: the grader whose rules gave `correct`.
ALTER TABLE workflows ADD COLUMN IF NOT EXISTS grader_version VARCHAR DEFAULT '1';
ALTER TABLE workflows ALTER COLUMN grader_version SET DEFAULT '2';

CREATE TABLE IF NOT EXISTS training_steps (
    run_id             VARCHAR NOT NULL,
    step               INTEGER NOT NULL,
    phase              VARCHAR,  -- sft | probe | grpo
    reward_mean        DOUBLE,
    reward_std         DOUBLE,
    frac_zero_std      DOUBLE,
    parse_fail_rate    DOUBLE,
    parse_codes        JSON,     -- {"no_workflow": 3, ...}
    group_size         INTEGER,
    completion_length  DOUBLE,
    loss               DOUBLE,
    learning_rate      DOUBLE,
    infra_excluded     DOUBLE,   -- share of rollouts excluded as infrastructure failures
    logged_at          TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (run_id, step)
);
-- Groups without a gradient: scorable rewards all equal or fewer than two scored (what the gate
-- judges by default), and groups whose rollouts are all correct or all not correct, format
-- ignored (no routing signal: such a group can only teach the format).
ALTER TABLE training_steps ADD COLUMN IF NOT EXISTS frac_groups_no_signal DOUBLE;
ALTER TABLE training_steps ADD COLUMN IF NOT EXISTS frac_same_correctness DOUBLE;

-- One row per question x worker: the majority verdict of that worker's scored probe samples
-- (strictly more than half correct; a tie counts as not solved). The oracle SQL reads this.
CREATE OR REPLACE VIEW outcomes AS
SELECT
    question_id,
    worker,
    2 * count_if(correct) > count(*) AS correct
FROM calls
WHERE kind = 'probe' AND correct IS NOT NULL
GROUP BY question_id, worker;
