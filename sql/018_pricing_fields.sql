-- /pricing refuses members it does not know.  A misspelt field
-- ("completion_rate") used to be dropped without a word, and the model was
-- then billed at the default completion ratio of 1.

ALTER FUNCTION llmgw_api_pricing(text, jsonb) RENAME TO llmgw_api_pricing_entries;

CREATE FUNCTION llmgw_api_pricing(p_method text, b jsonb)
RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    r  record;
    k  text;
BEGIN
    IF p_method <> 'GET' THEN
        FOR r IN SELECT key, value FROM jsonb_each(b) ORDER BY key LOOP
            CONTINUE WHEN jsonb_typeof(r.value) IS DISTINCT FROM 'object';
            FOR k IN SELECT jsonb_object_keys(r.value) ORDER BY 1 LOOP
                IF k <> ALL (ARRAY['ratio', 'completion_ratio', 'cache_ratio',
                                   'cache_creation_ratio', 'price',
                                   'unit_prices', 'multipliers']) THEN
                    PERFORM llmgw_bad(format('pricing.%s.%s: unknown field (known: ratio, completion_ratio, cache_ratio, cache_creation_ratio, price, unit_prices, multipliers)',
                                             r.key, k));
                END IF;
            END LOOP;
        END LOOP;
    END IF;

    RETURN llmgw_api_pricing_entries(p_method, b);
END $$;
