-- How many questions the warehouse holds per corpus, source split and level (NULL level: GSM8K,
-- and the two MATH problems labelled "Level ?"), with how many of them are MATH500 problems.
SELECT
    corpus,
    split,
    level,
    count(*) AS questions,
    count_if(in_math500) AS in_math500
FROM questions
GROUP BY corpus, split, level
ORDER BY corpus, split, level NULLS LAST;
